"""Stand-in of comfy_api.latest.ui: PreviewText (text shown on the node)."""


class PreviewText:
    def __init__(self, value: str, **kwargs):
        self.value = value

    def as_dict(self):
        return {"text": (self.value,)}
