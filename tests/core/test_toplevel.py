"""`from adaptkit import ...` (issue 38): the models' public check and generation result are top-level names, resolved
lazily (importing adaptkit imports no heavy library until a name is used)."""
import subprocess
import sys


def test_check_adapter_base_and_generated_text_are_top_level_names_imported_lazily():
    code = ("import sys, adaptkit\n"
            "assert {'check_adapter_base', 'GeneratedText'} <= set(adaptkit.__all__), adaptkit.__all__\n"
            "assert 'torch' not in sys.modules and 'adaptkit.models' not in sys.modules\n"
            "from adaptkit import GeneratedText, check_adapter_base\n"
            "import adaptkit.models as m\n"
            "assert (check_adapter_base, GeneratedText) == (m.check_adapter_base, m.GeneratedText)\n"
            "assert 'check_adapter_base' in dir(adaptkit)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
