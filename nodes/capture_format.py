"""The capture file's format tag, shared by the writer (node_capture) and the loader (study.videodata)."""
CAPTURE_FORMAT = "vc_attention_capture"
CAPTURE_VERSION = "1"
