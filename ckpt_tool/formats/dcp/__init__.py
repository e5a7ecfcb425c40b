"""torch.distributed.checkpoint (DCP) folders: listed from ``.metadata``, streamed from the shard files."""
