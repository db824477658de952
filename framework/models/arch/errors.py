"""The errors of loading a checkpoint with the framework's own architectures."""


class CheckpointFormatError(ValueError):
    """A checkpoint folder this package cannot load as it is; the message says what to change."""


class MissingCheckpointError(CheckpointFormatError, FileNotFoundError):
    """The folder, its ``config.json``, or its weight files do not exist."""


class UnsupportedArchitectureError(CheckpointFormatError):
    """``config.json`` names an architecture (or an option of one) that is not implemented here."""
