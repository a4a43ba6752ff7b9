"""This project's compact windowformer (`model=windowformer`): `model` holds the network."""
