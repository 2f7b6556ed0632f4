"""Stand-in of ComfyUI's server module: PromptServer.instance.send_sync (messages are recorded)."""


class PromptServer:
    instance = None

    def __init__(self):
        self.messages = []
        PromptServer.instance = self

    def send_sync(self, event, data, sid=None):
        self.messages.append((event, data, sid))
