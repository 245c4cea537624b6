"""The flow-matching scheduler settings every world image model samples with (FLUX.1 and FLUX.2 architectures)."""

SCHEDULER_CONFIG = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)
