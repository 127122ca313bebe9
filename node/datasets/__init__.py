"""Datasets in the node's checkpoint store (`store`): written by `locomesh data pack`, shared by
the checkpoint service like any checkpoint, loaded back verified."""
