"""Stand-in of ComfyUI's folder_paths: the output directory (tests set `output_directory`)."""
output_directory = None


def get_output_directory():
    return output_directory
