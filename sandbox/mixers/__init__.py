"""Token mixers, registered by name. Importing this package registers every mixer."""
from sandbox.mixers.base import (Mixer, MixerContext, NoConfig, build_mixer, mixer_config_class,
                                 mixer_names, register)

# Each import registers the mixers of one family.
from sandbox.mixers import attention  # noqa: E402,F401
from sandbox.mixers import linear_family, gsa  # noqa: E402,F401
from sandbox.mixers import swa  # noqa: E402,F401
from sandbox.mixers import lte  # noqa: E402,F401
from sandbox.mixers import block_sparse  # noqa: E402,F401
from sandbox.mixers import sse, mom, sla  # noqa: E402,F401

__all__ = ["Mixer", "MixerContext", "NoConfig", "build_mixer", "mixer_config_class",
           "mixer_names", "register"]
