"""Readers that fail on purpose (for the reliability tests): raise, miss a field, or kill their own process."""
import os
import signal

from mtl.core.registry import register_reader
from mtl.readers.synthetic import SyntheticReader


class _OneBadSample(SyntheticReader):
    """Synthetic samples with one bad sample, ``bad_index``."""

    def __init__(self, bad_index=5, **kwargs):
        super().__init__(**kwargs)
        self.bad_index = int(bad_index)


@register_reader("raising_synthetic")
class RaisingReader(_OneBadSample):
    """Synthetic samples, except that sample ``bad_index`` raises ValueError (a bug in a user's reader)."""

    def __getitem__(self, index):
        if index == self.bad_index:
            raise ValueError(f"cannot decode record {index}: deliberate failure")
        return super().__getitem__(index)


@register_reader("fieldless_synthetic")
class FieldlessReader(_OneBadSample):
    """Synthetic samples whose sample ``bad_index`` lacks the declared ``label`` field."""

    def __getitem__(self, index):
        sample = super().__getitem__(index)
        if index == self.bad_index:
            del sample["label"]
        return sample


@register_reader("self_killing_synthetic")
class SelfKillingReader(_OneBadSample):
    """Synthetic samples; reading sample ``bad_index`` SIGKILLs the reading process, as the OOM killer would."""

    def __getitem__(self, index):
        if index == self.bad_index:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)
