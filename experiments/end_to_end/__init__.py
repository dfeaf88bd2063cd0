"""Real-model runs (SmolLM2-135M through transformers): tok/s against plain ``generate``, choosing K, replays, bounds."""
