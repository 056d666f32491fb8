"""LM backends, role by role: which LM serves each MemSteer role, and what each role used.

Every role (``ROLES``) gets a ``dspy.LM`` from one config (CLI flags > environment > TOML file >
built-in default ``local/qwen2.5-coder-1.5b``). The default runs in-process through llama.cpp with
grammar-constrained JSON outputs; any LiteLLM model string works too. Usage is booked per role.
"""

from memsteer_dspy.lm.config import (
    DEFAULT_LM,
    LM_FORMS,
    ROLES,
    LMConfig,
    LMSpec,
    RoleLM,
    build_lm,
    cli_flag_for,
    env_var_for,
    load_lm_config,
    normalize_lm_string,
)
from memsteer_dspy.lm.model_files import (
    EMBEDDED_MODELS,
    EmbeddedModel,
    MissingModelFilesError,
    assemble_model,
    ensure_embedded_model,
    model_cache_dir,
    verify_model_file,
)
from memsteer_dspy.lm.usage import RoleUsage, UsageMeter

__all__ = [
    "DEFAULT_LM",
    "EMBEDDED_MODELS",
    "LM_FORMS",
    "ROLES",
    "EmbeddedModel",
    "LMConfig",
    "LMSpec",
    "MissingModelFilesError",
    "RoleLM",
    "RoleUsage",
    "UsageMeter",
    "assemble_model",
    "build_lm",
    "cli_flag_for",
    "ensure_embedded_model",
    "env_var_for",
    "load_lm_config",
    "model_cache_dir",
    "normalize_lm_string",
    "verify_model_file",
]
