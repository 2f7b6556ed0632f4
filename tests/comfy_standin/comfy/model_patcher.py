"""Stand-in of comfy/model_patcher.py: clone, model_options, callbacks, pre_run/cleanup."""
from .patcher_extension import CallbacksMP


def deepcopy_list_dict(obj):
    """comfy.utils.deepcopy_list_dict: dicts and lists are copied, every other object is shared."""
    if isinstance(obj, dict):
        return {k: deepcopy_list_dict(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [deepcopy_list_dict(v) for v in obj]
    return obj


class ModelPatcher:
    def __init__(self, model):
        self.model = model
        self.model_options = {"transformer_options": {}}
        self.callbacks = {}
        self.parent = None

    def clone(self):
        n = ModelPatcher(self.model)
        n.model_options = deepcopy_list_dict(self.model_options)
        n.callbacks = {k: {k1: c1.copy() for k1, c1 in c.items()} for k, c in self.callbacks.items()}
        n.parent = self
        return n

    def add_callback_with_key(self, call_type, key, callback):
        self.callbacks.setdefault(call_type, {}).setdefault(key, []).append(callback)

    def get_all_callbacks(self, call_type):
        return [cb for cbs in self.callbacks.get(call_type, {}).values() for cb in cbs]

    def get_model_object(self, name):
        return getattr(self.model, name)

    def pre_run(self):
        for callback in self.get_all_callbacks(CallbacksMP.ON_PRE_RUN):
            callback(self)

    def cleanup(self):
        for callback in self.get_all_callbacks(CallbacksMP.ON_CLEANUP):
            callback(self)
