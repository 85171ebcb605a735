"""Framework-neutral heart of pgolf: numpy, the standard library and sentencepiece only.

Everything both backends must agree on is defined here exactly once: the config,
the shard format, tokenizer byte tables, bits per byte, schedules, the canonical
parameter layout and initialisation, the int8 artifact and the training driver.
"""
