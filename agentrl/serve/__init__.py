"""An OpenAI-compatible chat server: the wire format (protocol), the HTTP app and its server
(app), and the backends that answer from the policy."""
