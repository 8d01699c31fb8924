"""Documents for people: the templates shared by the email, the PDF and the hosted page
(:mod:`.templates`), the PDF renderer (:mod:`.pdf`) and the signed links of the hosted
page (:mod:`.tokens`). docs/email.md describes them."""
