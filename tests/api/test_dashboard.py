"""The dashboard in a real headless browser (Debian's chromium driven by Playwright): it
shows the members of a live group and changes when a consumer joins. The screenshot is
kept in test-artifacts/dashboard.png for a human to look at."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness import CoordinatorProcess, Workers, create_topic, wait_for
from keyshard.local.broker import EmbeddedBroker
from tests.api.conftest import ADMIN_ARGS

pytestmark = [pytest.mark.integration, pytest.mark.coordinator_args(*ADMIN_ARGS)]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--headless=new",
]


# The colours (r,g,b,alpha) down the timeline's first and last pixel columns.
COLUMN_COLOURS = """() => {
    const c = document.getElementById('timeline');
    const column = (x) => {
        const data = c.getContext('2d').getImageData(x, 0, 1, c.height).data;
        const seen = new Set();
        for (let i = 0; i < data.length; i += 4) {
            seen.add(data[i] + ',' + data[i + 1] + ',' + data[i + 2] + ',' + data[i + 3]);
        }
        return [...seen];
    };
    return [column(1), column(c.width - 2)];
}"""


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (scripts/test.sh installs it when run as root)",
)
async def test_dashboard_follows_a_consumer_joining(
    coordinator: CoordinatorProcess, workers: Workers
) -> None:
    await follows_a_join(coordinator, workers)


@pytest.mark.brokers("tansu")
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
async def test_dashboard_with_roles_and_protected_reads(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    """The same, with admin roles on and reads protected: a viewer's token in the page's
    token box shows the group."""
    tokens, roles = tmp_path / "admin-tokens", tmp_path / "admin-roles"
    tokens.write_text("User:monitoring Zq9-viewer\nUser:ops Zq9-operator\n")
    roles.write_text("User:monitoring viewer *\nUser:ops operator demo*\n")
    coordinator = CoordinatorProcess(
        broker.bootstrap_servers, tmp_path,
        extra=[
            "--drain-timeout-ms", "2000", *ADMIN_ARGS, "--admin-auth-reads",
            "--admin-tokens-file", str(tokens), "--admin-roles-file", str(roles),
        ],
        admin_token="Zq9-operator",
    )  # fmt: skip
    workers = Workers(coordinator, tmp_path)
    try:
        await coordinator.start()
        await follows_a_join(coordinator, workers, token="Zq9-viewer")
    finally:
        workers.stop_all()
        coordinator.stop()


async def follows_a_join(
    coordinator: CoordinatorProcess, workers: Workers, token: str | None = None
) -> None:
    """The dashboard shows a group's member, then the second one that joins (with
    `token` typed in its token box)."""
    from playwright.async_api import async_playwright

    await create_topic(coordinator.bootstrap)
    workers.spawn("c0")
    first = await wait_for(lambda: coordinator.settled(1), 30, "1 settled member")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1000, "height": 900})
            await page.goto(coordinator.admin_url + "/")
            if token is not None:
                await page.fill("#token", token)
            rows = page.locator("#members tbody tr")
            await rows.first.wait_for(timeout=15_000)
            assert await rows.count() == 1
            assert first["members"][0]["member_id"] in await rows.first.inner_text()
            # Before the page opened nothing is known: blank, not the black of "unowned".
            left, right = await page.evaluate(COLUMN_COLOURS)
            assert left == ["0,0,0,0"], "the time before the page opened is drawn"
            assert "0,0,0,0" not in right
            assert "blank: before" in await page.locator(".axis").inner_text()

            workers.spawn("c1")
            second = await wait_for(lambda: coordinator.settled(2), 30, "2 settled members")
            for member in second["members"]:
                await page.locator(f'#members tr[data-member="{member["member_id"]}"]').wait_for(
                    timeout=15_000
                )
            assert await rows.count() == 2
            # The timeline shows two colours once the join has been drawn.
            await page.wait_for_function(
                """() => {
                    const c = document.getElementById('timeline');
                    const data = c.getContext('2d').getImageData(c.width - 2, 0, 1, c.height).data;
                    const seen = new Set();
                    for (let i = 0; i < data.length; i += 4) {
                        seen.add(data[i] + ',' + data[i + 1] + ',' + data[i + 2]);
                    }
                    return seen.size >= 2;
                }""",
                timeout=15_000,
            )
            assert "error" not in (await page.locator("#status").get_attribute("class") or "")
            ARTIFACTS.mkdir(exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            await browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
async def test_the_api_docs_render_without_a_network(coordinator: CoordinatorProcess) -> None:
    """Swagger UI at /docs with every request off this machine refused, as on a host with
    no way to a CDN: its scripts come from the coordinator, and it shows the API."""
    from playwright.async_api import Route, async_playwright

    refused: list[str] = []

    async def local_only(route: Route) -> None:
        if route.request.url.startswith(coordinator.admin_url):
            await route.continue_()
        else:
            refused.append(route.request.url)
            await route.abort()

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.route("**/*", local_only)
            await page.goto(coordinator.admin_url + "/docs")
            title = page.locator(".swagger-ui .info .title")
            await title.wait_for(timeout=15_000)
            assert "keyshard admin API" in await title.inner_text()
            await page.locator(".opblock-summary-path", has_text="/v1/groups").first.wait_for()
            assert refused == []
        finally:
            await browser.close()
