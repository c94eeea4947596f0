"""The functional API in the shape of the first workflow of LangGraph's guide ("Creating a
simple workflow", docs.langchain.com/oss/python/langgraph/use-functional-api: an @entrypoint
taking one dict, calling @task functions and resolving their futures): it charges (an @task,
no key) and then emails (an @task keyed on the thread). `workflow_async` is the same, all
`async def`."""

from langgraph.func import entrypoint, task

from effectdrill_graphs import ledger


@task
def charge(thread: str) -> str:
    ledger.record("charge", thread)
    return "charged"


@task
def email(thread: str) -> str:
    ledger.record("email", thread, "receipt")
    return "sent"


@entrypoint()
def workflow(inputs: dict) -> dict:
    charged = charge(inputs["thread"]).result()
    sent = email(inputs["thread"]).result()
    return {"charge": charged, "email": sent}


@task
async def charge_later(thread: str) -> str:
    ledger.record("charge", thread)
    return "charged"


@task
async def email_later(thread: str) -> str:
    ledger.record("email", thread, "receipt")
    return "sent"


@entrypoint()
async def workflow_async(inputs: dict) -> dict:
    charged = await charge_later(inputs["thread"])
    sent = await email_later(inputs["thread"])
    return {"charge": charged, "email": sent}


observe = ledger.observe
