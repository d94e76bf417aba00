"""ms-atb-generate, the batch tool: a client of LLM, in a package of its own (the engine never imports it).

  cli           the command: flags, exit codes, --merge
  job           the job's stages: read -> validate -> shard -> run -> write -> merge
  item          BatchItem, one input line from the file to its result line
  prompt_file   our input formats (text, JSONL) and standard input
  openai_batch  the OpenAI batch format, in and out
  results       our result lines
  output_file   one writer per output (OutputLock) and the ids already written (--resume)
  replicas      data-parallel replicas: the split, part files and the merge
  summary       the end-of-run summary
  quiet         MindSpore's warnings hidden unless --verbose
"""
