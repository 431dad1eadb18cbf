"""Images in: decoding with limits (`decode`) and per-family CPU preprocessing that matches the
Hugging Face image processors (`gemma3`, `qwen2_vl`). Numpy and Pillow only, no torch."""
