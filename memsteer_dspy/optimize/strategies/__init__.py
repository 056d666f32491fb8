"""The optimizer's strategies, one kind per module (as GEPA's ``strategies/``): accept rules
(:mod:`.acceptance`), parent selection (:mod:`.parents`), proposers (:mod:`.lm_proposer`,
:mod:`.optuna_proposer`) and screening (:mod:`.screening`). Each is written over the protocols of
:mod:`memsteer_dspy.optimize.types`; a new rule or selector is a new small class."""
