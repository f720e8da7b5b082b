# The benchmark's CPU configuration: a model small enough that its first iteration comes within a second.
out_dir = "out"
data_dir = "data/chars"
device = "cpu"
eval_interval = 250
eval_iters = 20
log_interval = 1
block_size = 64
batch_size = 12
n_layer = 4
n_head = 4
n_embd = 128
max_iters = 2000
lr_decay_iters = 2000
dropout = 0.0
