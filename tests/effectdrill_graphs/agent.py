"""LangGraph's prebuilt agent (langgraph.prebuilt.create_react_agent, version "v2": one Send per
tool call) over a scripted model: the first answer asks for two `lookup` calls, the second
answers. Each model call is an effect without a key (as a paid API call is), each lookup too.
The user's message is the thread id, which the model passes on to the tool.
"""

import warnings

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from effectdrill_graphs import ledger


class Scripted(BaseChatModel):
    """A chat model that needs no network: tool calls first, then an answer."""

    def bind_tools(self, tools, **kwargs):
        return self

    @property
    def _llm_type(self):
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        thread = messages[0].content
        ledger.record("model_call", thread)
        if any(m.type == "tool" for m in messages):
            answer = AIMessage(content="found")
        else:
            calls = [
                {"name": "lookup", "args": {"q": q, "thread": thread}, "id": f"call-{q}"}
                for q in ("a", "b")
            ]
            answer = AIMessage(content="", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=answer)])


@tool
def lookup(q: str, thread: str) -> str:
    """Look q up."""
    ledger.record("lookup", thread)
    return q.upper()


def build():
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():  # deprecated in favour of langchain's create_agent
        warnings.simplefilter("ignore")
        return create_react_agent(Scripted(), [lookup], version="v2")


observe = ledger.observe
