import os

# Tests run on the CPU with Triton's interpreter; set before anything imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
