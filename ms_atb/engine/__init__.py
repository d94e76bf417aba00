"""The engine, split as vLLM v1 splits it (docs/design.md, section 2):

  input_processor   prompt + SamplingParams -> a checked Request (before any work starts)
  engine            Engine: owns the scheduler, the model runner and the sampler; step() is
                    schedule -> execute -> sample -> update
  constraints       what one sample may take next (min_tokens, bad words, its structured output's grammar)
  structured_outputs  StructuredOutputManager: grammars (llguidance) checked, compiled once per constraint off the
                    step loop, masks filled while the model runs
  output_processor  sampled tokens -> text, stop strings, n samples, duplicates -> RequestOutput
  admission, run    one run: its requests admitted, engine steps until each is done, each output as it is made

The batch tool (ms_atb/batch) is a client of LLM and is never imported from here.
"""
