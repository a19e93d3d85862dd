"""The Gradio app over the run store: `envace app` (see `apps.app`)."""
