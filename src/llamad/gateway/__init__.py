"""The HTTP gateway: OpenAI, Anthropic and Ollama protocols over the llamad client (issue 19)."""
