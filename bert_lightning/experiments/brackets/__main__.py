from bert_lightning.experiments.brackets.report import main

main()
