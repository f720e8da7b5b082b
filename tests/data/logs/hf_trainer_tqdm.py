"""Wrote hf_trainer_tqdm.log: transformers 5.24.0, torch 2.13.0 (CPU), a 1-layer GPT-2 with random weights.

    python hf_trainer_tqdm.py > hf_trainer_tqdm.log 2>&1
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
data = []
for _ in range(64):
    ids = torch.randint(0, 64, (16,))
    data.append({"input_ids": ids, "labels": ids})
args = TrainingArguments(output_dir="out", max_steps=40, logging_steps=10, per_device_train_batch_size=4,
                         report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=20, use_cpu=True)
Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8]).train()
