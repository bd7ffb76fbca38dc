"""Fine-tune: `python finetune.py task=ad_relevance task.train_file=... init_from=...`
(installed: `bert-lightning finetune ...`, the same entry)."""

from bert_lightning.commands.finetune import main

if __name__ == "__main__":
    main()
