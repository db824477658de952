import os
import tempfile

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# remote-code test fixtures are copied into this folder instead of the user's HF cache
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="adec-hf-modules-"))
