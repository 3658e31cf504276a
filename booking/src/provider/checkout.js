// The fake provider's checkout page: Pay or Decline settles the payment, then back to the shop.
(() => {
  // The pay token is in the page's own URL; the way back is the one the provider checked (empty: none).
  const token = new URLSearchParams(location.search).get('token') || '';
  const back = document.querySelector('main').dataset.return;
  const settle = async (outcome) => {
    document.getElementById('note').textContent = 'Processing…';
    for (const b of document.querySelectorAll('button')) b.disabled = true;
    const res = await fetch(`${location.pathname.replace(/\/checkout$/, '/complete')}?token=${encodeURIComponent(token)}`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ outcome }),
    });
    document.getElementById('note').textContent = res.ok ? `Payment ${outcome}.` : `The payment could not be settled (${res.status}).`;
    if (res.ok && back) location.assign(back);
  };
  document.getElementById('pay').addEventListener('click', () => settle('succeeded'));
  document.getElementById('decline').addEventListener('click', () => settle('failed'));
})();
