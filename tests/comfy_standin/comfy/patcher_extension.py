"""Stand-in of comfy/patcher_extension.py: the callback names ModelPatcher runs."""


class CallbacksMP:
    ON_CLONE = "on_clone"
    ON_CLEANUP = "on_cleanup"
    ON_PRE_RUN = "on_pre_run"
    ON_PREPARE_STATE = "on_prepare_state"
