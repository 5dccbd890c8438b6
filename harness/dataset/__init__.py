"""A relocatable reference dataset: suite, shard views, reference store (chosen shards), shared
head, corpus texts with provenance, candidates' shard reports, protocol and dataset card.

Layout (every path inside is relative; the folder can be moved or copied anywhere)::

    dataset.json       manifest: schema, protocol version, identities and the parts' sizes
    README.md          dataset card        PROTOCOL.md   comparability rules
    suite/             suite.json + tokens.npy (authoritative token ids)
    shards/            shard-NN.json (context provenance) + shard-NN.npy (the shard's token rows)
    reference/         capture store holding the reference shards only
    head/              lm_head.safetensors + lm_head.json
    tokenizer/         tokenizer.json (re-derive the contexts from the texts)
    corpus/            the suite's documents + licence files
    reports/           <candidate>/shard-NN.json + .md
    checksums.txt      sha256 of every other file
"""
