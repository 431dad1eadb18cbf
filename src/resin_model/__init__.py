"""The model description both runner families share: typed `ModelConfig`, `config.json`
parsing, checkpoint names and formats (GGUF), quantized formats (`quant.py`, `quant_config.py`), model shapes, routing and logit rules, and the
runner-family contract (`family.py`) through which runner packages plug into `resin serve`."""
