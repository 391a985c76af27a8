"""What the bench table scripts share: reading a JSON file that a bench step may not have
written, or not whole."""
import json


def load_json(path):
    """The JSON in `path`; None where the file is missing or is not whole JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
