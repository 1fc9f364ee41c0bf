"""The error raised for missing, corrupt or mismatched checkpoint files."""


class CheckpointError(ValueError):
  """A checkpoint directory or file cannot be read as the expected model; the message names file and tensor."""
