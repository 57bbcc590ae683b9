"""What `quickdraft doctor` predicts for the loadgen's requests: its cost measurements, and the
acceptance measured on the loadgen's 8 chat prompts (32 greedy tokens each) instead of its own.

Usage: python doctor_loadgen.py [OUT.json]. Prints the doctor's report; writes its JSON to OUT.json.
"""

import argparse
import json
import sys

from quickdraft.bench.doctor import DoctorConfig, DoctorPrompt, diagnose, format_report
from quickdraft.cli_common import load_draft, load_target
from quickdraft.prompts import chat_prompt_ids
from quickdraft.server.loadgen import PROMPTS


# What `quickdraft doctor TARGET DRAFT` gives the loaders: every default.
args = argparse.Namespace(target="qwen2.5-coder-1.5b-instruct", draft="qwen2.5-coder-0.5b-instruct", dtype="auto",
                          draft_quantization="auto")
target = load_target(args, "cpu")
draft = load_draft(args, "auto", "cpu")
prompts = [DoctorPrompt("loadgen", tuple(chat_prompt_ids(target.tokenizer, [{"role": "user", "content": p}]))) for p in PROMPTS]
report = diagnose(target, draft, DoctorConfig(max_new_tokens=32, temperatures=(0.0,), time_budget=300),
                  prompts=prompts, log=lambda message: print(message, file=sys.stderr))
print(format_report(report))
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as handle:
        json.dump(report, handle, indent=1, default=str)
