"""The model description both runner families share: typed `ModelConfig`, `config.json`
parsing, checkpoint names and formats (GGUF; FP8 and MXFP4 in `quant.py` and `quant_config.py`),
model shapes, routing and logit rules, and the runner-family contract (`family.py`) through
which runner packages plug into `resin serve`."""
