"""Layer 2, models: the denoiser and tokenizer protocols (:mod:`.protocol`), the built-in tiny
denoiser (:mod:`.tiny`), its saved-folder format (:mod:`.saved`), and the Hugging Face adapters
(:mod:`.hub_adapters`, :mod:`.hub_loading`). Imports core and engine only."""
