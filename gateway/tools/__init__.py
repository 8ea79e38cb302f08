"""Tool calling on /v1/chat/completions: the request's tools, their prompt, the model's calls.

`types` holds the values; `request` validates `tools`, `tool_choice`,
`parallel_tool_calls` and the tool parts of messages; `render` turns a conversation into
what a chat template takes (with `generic_prompt` for templates that know no tools);
`formats` is the table of call formats per model family and `parse` reads calls out of
generated text, whole (`parse_calls`) or as a stream (`stream.CallStream`); `output`
shapes them as OpenAI's `tool_calls`; `schema` is the JSON schema that `required` and a
named `tool_choice` will be enforced with.
"""
