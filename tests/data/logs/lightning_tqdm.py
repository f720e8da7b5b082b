"""Wrote lightning_tqdm.log: pytorch-lightning 2.6.6, torch 2.13.0 (CPU), tqdm 4.70.1.

    python lightning_tqdm.py > lightning_tqdm.log 2>&1

lightning_rich.log is the same run without the callbacks argument (rich installed: RichProgressBar).
"""
import torch, pytorch_lightning as pl
from torch.utils.data import DataLoader, TensorDataset
class M(pl.LightningModule):
    def __init__(self):
        super().__init__(); self.l = torch.nn.Linear(4, 1)
    def training_step(self, b, i):
        loss = torch.nn.functional.mse_loss(self.l(b[0]), b[1]); self.log("train_loss", loss, prog_bar=True); return loss
    def validation_step(self, b, i):
        self.log("val_loss", torch.nn.functional.mse_loss(self.l(b[0]), b[1]), prog_bar=True)
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.1)
ds = TensorDataset(torch.randn(200, 4), torch.randn(200, 1))
pl.Trainer(max_epochs=2, callbacks=[pl.callbacks.TQDMProgressBar()], accelerator="cpu", logger=False, enable_checkpointing=False).fit(
    M(), DataLoader(ds, batch_size=10), DataLoader(ds, batch_size=50))
