"""Wrote lightning_tqdm.log: pytorch-lightning 2.6.6, torch 2.13.0 (CPU), tqdm 4.70.1.

    python lightning_tqdm.py > lightning_tqdm.log 2>&1

lightning_rich.log is the same run without the callbacks argument (rich installed: RichProgressBar).
"""

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class Linear(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        loss = torch.nn.functional.mse_loss(self.l(batch[0]), batch[1])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, i):
        self.log("val_loss", torch.nn.functional.mse_loss(self.l(batch[0]), batch[1]), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = TensorDataset(torch.randn(200, 4), torch.randn(200, 1))
trainer = pl.Trainer(max_epochs=2, callbacks=[pl.callbacks.TQDMProgressBar()], accelerator="cpu", logger=False,
                     enable_checkpointing=False)
trainer.fit(Linear(), DataLoader(data, batch_size=10), DataLoader(data, batch_size=50))
