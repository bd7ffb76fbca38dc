"""The Lightning layer: the two LightningModules, callbacks, resume and checkpoint IO,
strategies, and the two run orchestrators (`pretrain.train`, `finetune.finetune`) that go
through one run skeleton (`run.run`) and share one trainer builder (`trainer.build_trainer`)."""
