"""CREDIT's files as CREDIT writes them, read (and, for tests and smoke runs, written) here:
one module per CREDIT concept.

- config files: `config_file` (the table mapping a CREDIT config to this project's overrides),
  `config_gen1` and `config_gen2` (the conversions of each schema), `paths` (CREDIT's path
  expansion);
- data layouts: `layout` (what both readers share: grid, levels, channel names, checks),
  `data_gen1` (yearly netCDF files with mean/std files), `data_gen2` (CREDIT's gen2 sources);
- generators of data in those layouts: `generate_gen1`, `generate_gen2`;
- checkpoints: `checkpoint_import` (CREDIT's checkpoint.pt to a DCP checkpoint of this
  project), `training_state` (continuing CREDIT's run: weights, AdamW state, step).

CREDIT's model classes, their blocks and post blocks are this project's models
(`credit.models.credit`). This package imports the layers below it (data, checkpoint, models)
and nothing imports it back at module level except the commands that read CREDIT's files.
"""
