"""The ledger's vocabulary, spelled once: the stages records are filed under, their events, a release's final statuses.

Every module that writes or reads records (the release, promotion, the stages, views, audit, the registry view, the
DAGs) names events through these constants, so a new status is added in one place and no reader misses it. Imports
nothing: DAG files read it at parse time.
"""

from __future__ import annotations

# The release's stages, in order (the stage table, tasks.pipeline.table, gives each its function and its policy).
RESOLVE, BUILD, PACKAGE, IMAGE = "resolve", "build", "package", "image"
DEPLOY_CANDIDATE, VALIDATE, PROMOTE, TEARDOWN = "deploy_candidate", "validate", "promote", "teardown_candidate"
STAGES = (RESOLVE, BUILD, PACKAGE, IMAGE, DEPLOY_CANDIDATE, VALIDATE, PROMOTE, TEARDOWN)

# Stages a record is filed under besides those.
RELEASE = "release"  # the release's own records: opened, options, and its final status
TRAFFIC = "traffic"  # one record per traffic step of a rollout (event STEP), appended as the step happens
BAKE = "bake"  # one record per bake verdict of a traffic step (event VERDICT), appended as the bake ends
ROLLOUT = "rollout"  # what a backend's update of production replaces (event REPLACED), appended before it is sent

# Events of a stage run.
STARTED, SUCCEEDED, FAILED = "started", "succeeded", "failed"
SKIPPED, KEPT, ROLLED_BACK = "skipped", "kept", "rolled_back"
DONE = (SUCCEEDED, SKIPPED, KEPT, ROLLED_BACK)  # a stage that ended with one of these is not run again
STEP = "step"  # a traffic step: copies moved (a batch, a rollback batch) or, where SageMaker drives them, a check seen
# a bake's verdict on a traffic step: alarm states, the online gate's evidence, the alarm that fired
VERDICT = "verdict"
# what a backend's rolling update replaces (stage ROLLOUT), recorded before the update is sent: what is put back
# when the update ends on a spec its last verdict refuses, also by a rerun that did not send it
REPLACED = "replaced"

# Events of the release stage.
OPENED, OPTIONS = "opened", "options"
# a rerun took the promotion lease from a run of the same release that had stopped
LEASE_TAKEN_OVER = "lease_taken_over"
PROMOTED, REJECTED = "promoted", "rejected"
SWEPT = "swept"  # a sweep's candidate release, gated on the sweep's tasks and torn down: never meant for production
FINISHED = (PROMOTED, REJECTED, ROLLED_BACK, SWEPT)  # final statuses a rerun has nothing left to do for
FINAL = (*FINISHED, FAILED)  # every final status of a release

# A release's approval records (stage APPROVAL), when its config requires a person to approve it before production:
# AWAITING_APPROVAL once its gate passed, then one decision: APPROVED, REJECTED (by an approver) or TIMED_OUT.
APPROVAL = "approval"
AWAITING_APPROVAL, APPROVED, TIMED_OUT = "awaiting_approval", "approved", "timed_out"
APPROVAL_DECISIONS = (APPROVED, REJECTED, TIMED_OUT)

# A shared endpoint's layout change (`shiplift fleet move`): each model's move is a promotion of the release serving it
# (trigger "move"); once no model serves on the old endpoint, its deletion is recorded in each moved model's history.
FLEET = "fleet"
RETIRED = "retired"
MOVE = "move"  # the trigger of the promotion record of a fleet move

# A candidate sweep's own records (tasks.sweeps; release id: the sweep's id, model: its base config's): OPENED with the
# rule's sha256 and the candidates before any is evaluated, EVALUATED once per candidate (its evidence) or FAILED, then
# PICKED (the frontier and the pick), and HANDED_OFF when the pick's own release is run.
SWEEP = "sweep"
EVALUATED, PICKED, HANDED_OFF = "evaluated", "picked", "handed_off"

# The ledger's own records: each signed checkpoint is recorded in the chain it signs (stage, release and model LEDGER:
# never a model's name, which must start with a letter or digit, tasks.config_types.NAME_PATTERN).
LEDGER = "_ledger"
CHECKPOINTED = "checkpointed"
