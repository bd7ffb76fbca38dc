"""The README's results table from `outputs/results/*/results.json` (bench/finetune_results.sh)."""

import json
import sys
from pathlib import Path

ROWS = [
    ("sst2", "SST-2 dev accuracy", "test/acc"),
    ("cola", "CoLA in-domain dev MCC", "test/mcc"),
    ("wnut", "WNUT-17 dev entity F1", "test/f1"),
    ("hd", "Home Depot test Spearman", "test/spearman"),
    ("hd", "Home Depot test NDCG@10", "test/ndcg@10"),
]
INITS = [
    ("a_ours", "(a) ours, CPU-pretrained"),
    ("b_random", "(b) no pretraining"),
    ("c_minilm", "(c) all-MiniLM-L6-v2"),
]


def main(root: Path) -> None:
    print("| metric | " + " | ".join(name for _, name in INITS) + " |")
    print("|---" * (len(INITS) + 1) + "|")
    for key, label, metric in ROWS:
        cells = []
        for init, _ in INITS:
            path = root / f"{key}_{init}" / "results.json"
            cells.append(
                f"{json.loads(path.read_text())['test'][metric]:.3f}" if path.is_file() else "n/a"
            )
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/results"))
