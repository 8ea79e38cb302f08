"""The generic tool prompt, for chat templates that do not render tools themselves.

Hermes style (the text of Qwen2.5's own template): a system-prompt block lists the tools
as JSON, one per line, and asks for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
which the `hermes` parser reads. Past calls are written into the assistant's text the
same way, and tool results go back as user messages in `<tool_response>` tags.
"""

from __future__ import annotations

SYSTEM_BLOCK = """\
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

CALL = "<tool_call>\n{call}\n</tool_call>"  # call: {"name": ..., "arguments": {...}}
RESULT = "<tool_response>\n{content}\n</tool_response>"
RESULT_ROLE = "user"  # the role tool results take in the conversation
