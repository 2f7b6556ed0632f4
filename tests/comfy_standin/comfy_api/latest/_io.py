"""Stand-in of comfy_api.latest.io: schema, typed inputs/outputs, hidden values, NodeOutput.

Inputs keep their constructor arguments as attributes under ComfyUI's names (id, default, min,
max, step, options, tooltip, advanced, ...). PREPARE_CLASS_CLONE mirrors how ComfyUI's executor
gives each execution a class copy whose `hidden` holds UNIQUE_ID and friends.
"""
from dataclasses import dataclass, field
from enum import Enum


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"


class HiddenHolder:
    def __init__(self, values: dict):
        self.unique_id = values.get(Hidden.unique_id)
        self.prompt = values.get(Hidden.prompt)


class _Input:
    io_type = None

    def __init__(self, id, display_name=None, optional=False, tooltip=None, default=None, advanced=None, **extra):
        self.id, self.display_name, self.optional = id, display_name, optional
        self.tooltip, self.default, self.advanced = tooltip, default, advanced
        for key, value in extra.items():
            setattr(self, key, value)


class _Output:
    io_type = None

    def __init__(self, id=None, display_name=None, tooltip=None, is_output_list=False):
        self.id, self.display_name, self.tooltip, self.is_output_list = id, display_name or id, tooltip, is_output_list


def _type(name, io_type):
    return type(name, (), {"io_type": io_type, "Input": type("Input", (_Input,), {"io_type": io_type}),
                           "Output": type("Output", (_Output,), {"io_type": io_type})})


Model, Image, Float = _type("Model", "MODEL"), _type("Image", "IMAGE"), _type("Float", "FLOAT")
Int, Boolean, String = _type("Int", "INT"), _type("Boolean", "BOOLEAN"), _type("String", "STRING")


class Combo:
    class Input(_Input):
        io_type = "COMBO"

        def __init__(self, id, options=None, display_name=None, optional=False, tooltip=None, default=None, advanced=None, **extra):
            super().__init__(id, display_name, optional, tooltip, default, advanced, options=list(options or []), **extra)



@dataclass
class Schema:
    node_id: str
    display_name: str = None
    category: str = "sd"
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    hidden: list = field(default_factory=list)
    description: str = ""
    is_output_node: bool = False
    is_experimental: bool = False

    def validate(self):
        ids = [i.id for i in self.inputs]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate input ids in {self.node_id}")


class NodeOutput:
    def __init__(self, *args, ui=None, expand=None, block_execution=None):
        self.args, self.ui = args, ui

    @property
    def result(self):
        return self.args if len(self.args) > 0 else None


class ComfyNode:
    hidden = None

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls) -> Schema:
        schema = cls.define_schema()
        schema.validate()
        return schema

    @classmethod
    def PREPARE_CLASS_CLONE(cls, v3_data):
        """v3_data = {"hidden_inputs": {Hidden.unique_id: ..., ...}} or None, as ComfyUI passes it."""
        clone = type(f"{cls.__name__}Clone", (cls,), {})
        clone.hidden = HiddenHolder(v3_data["hidden_inputs"] if v3_data else {})
        return clone
