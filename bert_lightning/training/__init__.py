"""The Lightning layer: the LightningModules (pretraining by MLM/NSP, RTD or distillation;
fine-tuning), callbacks, resume and checkpoint IO, strategies, and the two run orchestrators
(`pretrain.train`, `finetune.finetune`) that go through one run skeleton (`run.run`) and share
one trainer builder (`trainer.build_trainer`; `evaluate`'s is `trainer.evaluation_trainer`)."""
