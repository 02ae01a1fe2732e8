"""The GGUF file, read and understood: nothing here computes or allocates model bytes.

    header.py     the GGUF header: metadata and tensor directory, validated, no tensor bytes
    model.py      ModelSpec, TensorIndex, ExpertTable (every expert's gate/up/down offsets) and
                  the anatomy (`sdq info`, table T2)
    quants.py     the one table of quant-type facts (block size, bytes per block), built on
                  gguf's GGML_QUANT_SIZES: the reader, the plan and the kernels use it
    tokenizer.py  the BPE tokenizer from the file's metadata (HF `tokenizers`)
    chat_template.py  chat messages -> prompt text by the file's Jinja chat template (sandboxed)

May import: sdq.errors, sdq.units, sdq.files, sdq.dirs.
"""
