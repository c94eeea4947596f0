"""Graphs in the shapes real applications take, each built from LangGraph's own public APIs,
over a scripted chat model (no network) and effects in the ledger's SQLite file (EFFECTS_DB):

- support(): a support bot in the shape of LangGraph's customer-support tutorial: an assistant
  node, its tools in `ToolNode(...).with_fallbacks(...)` (RunnableWithFallbacks, whose
  `__getattr__` reads ToolNode's type hints: a probe such as `hasattr(node, "afunc")` raises
  NameError on it), a static breakpoint before the tools (`interrupt_before`), and a booking
  made without a key;
- triager(): async nodes; one runs an agent compiled inside it (create_react_agent, called as
  a function: `await agent.ainvoke(...)`), whose tool posts a comment without a key;
- lambda_tool(): a node that is a RunnableLambda running a tool (`tool.invoke`).

The user's message is the thread id; the scripted model passes it to each tool it calls.
"""

import warnings
from typing import Annotated, TypedDict

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from effectdrill_graphs import ledger


class Scripted(BaseChatModel):
    """Asks for `tool` once (call id `call-<tool>`), then answers: no network, no model."""

    tool: str

    def bind_tools(self, tools, **kwargs):
        return self

    @property
    def _llm_type(self):
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        thread = messages[0].content
        if any(m.type == "tool" for m in messages):
            answer = AIMessage(content="done")
        else:
            call = {"name": self.tool, "args": {"thread": thread}, "id": f"call-{self.tool}"}
            answer = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=answer)])


class Chat(TypedDict):
    messages: Annotated[list, add_messages]


@tool
def book_flight(thread: str) -> str:
    """Book the customer's flight (no key: a second call books a second seat)."""
    ledger.record("booking", thread)
    return "booked"


@tool
def post_comment(thread: str) -> str:
    """Comment on the issue (no key: a second call posts a second comment)."""
    ledger.record("comment", thread)
    return "commented"


@tool
def create_price(thread: str) -> str:
    """Create a price (no key)."""
    ledger.record("price", thread)
    return "price_1"


def handle_tool_error(state):
    """The tutorial's fallback: the tool's error as a ToolMessage, for the model to read."""
    error = state.get("error")
    calls = state["messages"][-1].tool_calls
    return {
        "messages": [ToolMessage(content=f"Error: {error!r}", tool_call_id=c["id"]) for c in calls]
    }


def route(state):
    return "tools" if state["messages"][-1].tool_calls else END


def support():
    from langgraph.prebuilt import ToolNode

    model = Scripted(tool="book_flight")
    tools = ToolNode([book_flight]).with_fallbacks(
        [RunnableLambda(handle_tool_error)], exception_key="error"
    )
    builder = StateGraph(Chat)
    builder.add_node("assistant", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_node("tools", tools)
    builder.add_edge(START, "assistant")
    builder.add_conditional_edges("assistant", route, ["tools", END])
    builder.add_edge("tools", "assistant")
    return builder.compile(interrupt_before=["tools"])


def triager():
    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():  # deprecated in favour of langchain's create_agent
        warnings.simplefilter("ignore")
        agent = create_react_agent(Scripted(tool="post_comment"), [post_comment], version="v2")

    async def label(state: Chat):
        return {"messages": [AIMessage(content="labelled")]}

    async def comment(state: Chat):  # an agent run inside a node, as a function
        result = await agent.ainvoke({"messages": state["messages"][:1]})
        return {"messages": [result["messages"][-1]]}

    builder = StateGraph(Chat)
    builder.add_node("label", label)
    builder.add_node("comment", comment)
    builder.add_edge(START, "label")
    builder.add_edge("label", "comment")
    builder.add_edge("comment", END)
    return builder.compile()


def lambda_tool():
    def price(state: Chat):
        thread = state["messages"][0].content
        return {"messages": [AIMessage(content=create_price.invoke({"thread": thread}))]}

    builder = StateGraph(Chat)
    builder.add_node("price", RunnableLambda(price))
    builder.add_edge(START, "price")
    builder.add_edge("price", END)
    return builder.compile()


observe = ledger.observe
