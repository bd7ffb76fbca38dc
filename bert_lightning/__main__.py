from bert_lightning.cli import main

main()
