"""What regen knows of target families: how a chat template behaves, and how a target's output is read.

Both sides use it: ``regen submit`` chooses a run's parsers and thinking switch by
rendering the model's template; the worker renders prompts and reads each generated
turn back with the same choice. Nothing here imports vLLM at module load:
vllm_compat.py finds vLLM's parser classes when a worker first needs them.

In the order a run meets them::

    template_probe.py  a chat template rendered on probe conversations: wire format, thought, switch
    parser_choice.py   which vLLM reasoning and tool parsers read a run: named, or read off the template
    turn_parsers.py    one generated turn to thought, answer and calls, with the run's parsers
      vllm_compat.py   where this vLLM keeps its parser classes and chat request model
      parsing.py       the result types, and regen's own Qwen3 fallback (pure text)
"""
