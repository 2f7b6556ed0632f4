"""Run by tests/test_workflows.py in a Python that has ComfyUI's requirements (not collected by pytest).

usage: comfyui_workflow_probe.py COMFYUI_PATH PACK_DIR REPORT_JSON MODELS_DIR TYPE,TYPE,... WORKFLOW...

Loads ComfyUI's nodes (core + comfy_extras) and this pack the way ComfyUI's loader does, writes each
listed node type's definition (sockets, widgets in order, outputs), converts every workflow from the
UI format to an API prompt the way the front end does (widgets by position, seed control values
skipped, UI-only nodes dropped) and runs ComfyUI's own `execution.validate_prompt` on it. Model
files the workflows name are created as empty placeholders under MODELS_DIR, so validation checks
names, types, ranges and links without any weights.
"""
import asyncio
import inspect
import json
import os
import sys
import tempfile

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
MODEL_FOLDERS = {"unet_name": "diffusion_models", "clip_name": "text_encoders", "clip_name1": "text_encoders",
                 "clip_name2": "text_encoders", "vae_name": "vae", "ckpt_name": "checkpoints"}
UI_ONLY = {"Note", "MarkdownNote"}


def is_widget(spec) -> bool:
    kind, opts = spec[0], (spec[1] if len(spec) > 1 else {}) or {}
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not opts.get("forceInput")


def definition(cls) -> dict:
    types = cls.INPUT_TYPES()
    out = {"sockets": {}, "optional_sockets": {}, "widgets": [], "seed_widgets": [], "outputs": list(cls.RETURN_TYPES)}
    for section in ("required", "optional"):
        for name, spec in types.get(section, {}).items():
            if is_widget(spec):
                out["widgets"].append(name)
                if len(spec) > 1 and (spec[1] or {}).get("control_after_generate"):
                    out["seed_widgets"].append(name)
            else:
                out["sockets" if section == "required" else "optional_sockets"][name] = spec[0]
    return out


def to_prompt(doc: dict, definitions: dict) -> dict:
    links = {link[0]: link for link in doc["links"]}
    prompt = {}
    for node in doc["nodes"]:
        if node["type"] in UI_ONLY or node.get("mode", 0) != 0:
            continue
        spec = definitions[node["type"]]
        values = list(node.get("widgets_values") or [])
        inputs = {}
        for name in spec["widgets"]:
            if not values:
                break
            inputs[name] = values.pop(0)
            if name in spec["seed_widgets"]:
                values.pop(0)
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                link = links[inp["link"]]
                inputs[inp["name"]] = [str(link[1]), link[2]]
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs, "_meta": {"title": node.get("title", node["type"])}}
    return prompt


def make_placeholders(prompts, models_dir, folder_paths) -> None:
    """An empty file for every model name a loader widget asks for, in that loader's folder."""
    for folder in set(MODEL_FOLDERS.values()):
        os.makedirs(os.path.join(models_dir, folder), exist_ok=True)
        folder_paths.add_model_folder_path(folder, os.path.join(models_dir, folder))
    for prompt in prompts:
        for node in prompt.values():
            for name, value in node["inputs"].items():
                if name in MODEL_FOLDERS:
                    open(os.path.join(models_dir, MODEL_FOLDERS[name], value), "wb").close()


async def main(comfy_path, pack_dir, report_path, models_dir, type_list, workflow_paths):
    sys.path.insert(0, comfy_path)
    os.chdir(comfy_path)
    sys.argv = ["main.py", "--cpu"]
    import comfyui_pyav  # beside this script

    pyav_placeholder = comfyui_pyav.install_if_allowed()
    import comfy.options

    comfy.options.enable_args_parsing()
    import folder_paths
    import execution
    import nodes

    await nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False)
    # load the pack under its repository name, as `git clone` into custom_nodes/ would
    link_dir = tempfile.mkdtemp()
    pack_link = os.path.join(link_dir, "ComfyUI-VC-Attention")
    os.symlink(pack_dir, pack_link)
    if not await nodes.load_custom_node(pack_link):
        raise SystemExit("ComfyUI could not load the VC-Attention pack (see the log above).")

    report = {"nodes": {}, "validation": {}, "pyav_placeholder": pyav_placeholder}
    for type_name in type_list:
        cls = nodes.NODE_CLASS_MAPPINGS.get(type_name)
        report["nodes"][type_name] = None if cls is None else definition(cls)
    definitions = {t: report["nodes"][t] for t in type_list if report["nodes"][t]}
    prompts = {}
    for path in workflow_paths:
        with open(path, encoding="utf-8") as f:
            prompts[path] = to_prompt(json.load(f), definitions)
    make_placeholders(prompts.values(), models_dir, folder_paths)
    takes_id = len(inspect.signature(execution.validate_prompt).parameters) >= 3
    for path, prompt in prompts.items():
        args = ("probe", prompt, None) if takes_id else (prompt,)
        result = execution.validate_prompt(*args)
        if inspect.isawaitable(result):
            result = await result
        valid, error, outputs, node_errors = result
        report["validation"][os.path.basename(path)] = {"valid": bool(valid), "error": error, "node_errors": node_errors}
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)


if __name__ == "__main__":
    comfy_path, pack_dir, report_path, models_dir, types = sys.argv[1:6]
    asyncio.run(main(comfy_path, pack_dir, report_path, models_dir, types.split(","), sys.argv[6:]))
