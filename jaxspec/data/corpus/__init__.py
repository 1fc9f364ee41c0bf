"""The EN-DE corpus builder: readers of German/English sources, aligners, filters, and the build itself.

- catalogs.py: gettext catalogs (software strings) and the Ding dictionary's example sentences.
- markup.py, manpages.py: blocks of HTML/XML documents and of man pages.
- align.py: block alignment by structure, sentence alignment inside blocks.
- text.py: sentence splitting, language check, pair filters, the English key used to remove repeats.
- sources.py: the table of documentation packages and the pairs aligned from them.
- build.py: reading everything, removing repeats, splitting, writing the TSVs and counts.json.
launch/build_corpus.py is the command line; docs/corpus.md describes the sources, licences and counts.
"""
