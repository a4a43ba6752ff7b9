"""CREDIT's model family: the older crossformer, wxformer and nextgen_wxformer (CREDIT's
registry names), their blocks (`layers`, `convs`, the deterministic attention), CREDIT's
decoder attentions and post blocks, and what reads CREDIT's files: its model config
(`config`), its checkpoints (`checkpoint`) and their convolutional-to-Linear remap (`remap`)."""
