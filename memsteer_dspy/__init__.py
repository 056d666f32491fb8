"""memsteer-dspy: MemSteer supervision from unlabeled user histories, and evidence-guided
memory-design optimization, as DSPy programs."""

import os as _os

# LiteLLM (under DSPy) fetches a model price map from the internet at import time and retries for
# several seconds when offline; its bundled copy is what we want. Users can still override this.
_os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
